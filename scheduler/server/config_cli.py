"""``scheduler config keygen | sign | publish``: the operator's side of signed config
(``scheduler.server.config_signing``; docs/hot-reload.md "Signed versions").

- ``keygen --kid ID --out FILE [--trust TRUST]``: a new Ed25519 key pair; the private key goes to
  FILE (mode 0600, never overwritten), its public half to the trust file routers read
  (``--config-trust``), or to stdout.
- ``sign [files] [--out SIG]``: validates the files as a router does and writes their detached
  signature (a router given ``--config-signature SIG`` publishes them).
- ``publish [files] --namespace NS``: validates, signs and writes them to the state store as the
  fleet's next version; every router that trusts the key adopts it within its sync interval.

The private key comes from ``--signing-key FILE``, ``$SCHEDULER_CONFIG_SIGNING_KEY_FILE`` or
``$SCHEDULER_CONFIG_SIGNING_KEY`` (the file's content), never from an argument's value; the store
URL from ``--state-file``, ``$SCHEDULER_STATE`` or ``--state``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from scheduler.config.args import add_config_dirs, config_actions
from scheduler.server.config_signing import SIGNING_KEY_ENV, SIGNING_KEY_FILE_ENV
from scheduler.state.url import STATE_ENV


def register(sub: Any) -> None:
    actions = config_actions(sub)
    keygen = actions.add_parser("keygen", help="make a config signing key pair (the routers trust its public half)")
    keygen.add_argument("--kid", required=True, help="key id, e.g. ops-2026-1 (routers name it when they refuse)")
    keygen.add_argument("--out", type=Path, required=True, metavar="FILE",
                        help="where to write the PRIVATE key (mode 0600; an existing file is never overwritten)")
    keygen.add_argument("--trust", type=Path, metavar="FILE",
                        help="add the public key to this trust file (created if missing; the routers' "
                             "--config-trust); default: print the entry")
    keygen.set_defaults(handler=_keygen)

    signing_help = (f"the private key file (default ${SIGNING_KEY_FILE_ENV}, or the content in ${SIGNING_KEY_ENV}; "
                    "never the key itself on the command line)")
    sign = actions.add_parser("sign", help="sign config files: the detached signature a router publishes them with")
    _bundle_args(sign)
    sign.add_argument("--signing-key", type=Path, metavar="FILE", help=signing_help)
    sign.add_argument("--out", type=Path, metavar="FILE", help="write the signature here (default: stdout)")
    sign.set_defaults(handler=_sign)

    publish = actions.add_parser("publish", help="sign config files and publish them as every router's next version")
    _bundle_args(publish)
    publish.add_argument("--signing-key", type=Path, metavar="FILE", help=signing_help)
    publish.add_argument("--state", default=None,
                         help=f"the state store URL (local use: a password here shows in ps; default --state-file, "
                              f"else ${STATE_ENV})")
    publish.add_argument("--state-file", type=Path, metavar="PATH", help="a file holding the state store URL")
    publish.add_argument("--namespace", default="default", help="the routers' key namespace (their --namespace)")
    publish.set_defaults(handler=_publish)


def _bundle_args(parser: argparse.ArgumentParser) -> None:
    """The files of a bundle, named as the router's flags name them: sign what the routers read."""
    add_config_dirs(parser)
    parser.add_argument("--policy", default="default", help="the routers' --policy (checked to exist)")
    parser.add_argument("--keys", type=Path, help="the routers' API keys file (their --keys)")
    parser.add_argument("--budgets", type=Path, help="the routers' budgets file (their --budgets)")


def _keygen(args: argparse.Namespace) -> int:
    import yaml

    from scheduler.server.config_signing import ConfigTrust, SigningError, SigningKey

    try:
        key = SigningKey.generate(args.kid)
        trust_text = None
        if args.trust is not None:
            existing = ConfigTrust.load(args.trust) if args.trust.exists() else ConfigTrust()
            if key.key_id in existing.keys:
                print(f"{args.trust}: keys.{key.key_id}: already there; choose another --kid", file=sys.stderr)
                return 1
            entries = yaml.safe_load(args.trust.read_text())["keys"] if existing.keys else {}
            trust_text = yaml.safe_dump({"keys": {**entries, key.key_id: key.public_b64()}}, sort_keys=False)
    except SigningError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        # O_EXCL: never replace a key (a lost private key cannot be recovered); 0600 from the start.
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"{args.out}: exists; not overwritten (choose another --out)", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{args.out}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 1
    with os.fdopen(fd, "w") as out:
        out.write(key.to_text())
    print(f"private key {key.key_id} written to {args.out} (keep it in your secret manager; routers never need it)")
    if trust_text is None:
        print("add to the routers' trust file (--config-trust):")
        print(yaml.safe_dump({"keys": {key.key_id: key.public_b64()}}, sort_keys=False), end="")
    else:
        args.trust.write_text(trust_text)
        print(f"public key {key.key_id} added to {args.trust}")
    return 0


def _signed_bundle(args: argparse.Namespace) -> tuple[Any, Any] | int:
    """The files read and validated as a router reads them, and their signature (or the exit code)."""
    from scheduler.config.loader import ConfigError
    from scheduler.server.config_reload.sources import ConfigSources, read_bundle, validate_bundle
    from scheduler.server.config_signing import SigningError, SigningKey

    sources = ConfigSources(args.regions, args.policies, args.policy, args.keys, args.budgets)
    try:
        key = SigningKey.from_env_or_file(args.signing_key)
        bundle = read_bundle(sources)
        validate_bundle(bundle, sources.policy, sources.parts, sources.shown())
    except SigningError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        print("not signed: the files have problems", file=sys.stderr)
        return 1
    return bundle, key.sign(bundle.digest, time.time())


def _sign(args: argparse.Namespace) -> int:
    signed = _signed_bundle(args)
    if isinstance(signed, int):
        return signed
    bundle, signature = signed
    if args.out is None:
        print(signature.to_text(), end="")
    else:
        args.out.write_text(signature.to_text())
    print(f"signed bundle {bundle.digest[:12]} with key {signature.key_id}", file=sys.stderr)
    return 0


def _publish(args: argparse.Namespace) -> int:
    import asyncio

    from scheduler.server.config_reload.store import ConfigStore, default_owner
    from scheduler.state.factory import open_store
    from scheduler.state.store import StateUnavailable
    from scheduler.state.url import StateUrlError, resolve_state_url

    try:
        state = resolve_state_url(args.state, args.state_file, "")
    except StateUrlError as exc:
        print(exc, file=sys.stderr)
        return 2
    if state.url in ("", "memory"):
        print(f"config publish: no shared state store: pass --state-file PATH or set ${STATE_ENV} "
              "(the routers' store URL)", file=sys.stderr)
        return 2
    if state.source == "--state" and state.has_password:
        print(f"warning: --state holds a password, visible in ps; use --state-file or ${STATE_ENV}", file=sys.stderr)
    signed = _signed_bundle(args)
    if isinstance(signed, int):
        return signed
    bundle, signature = signed
    try:
        store = open_store(state.url, args.namespace)
    except ValueError:
        print(f"{state.source}: expected redis://HOST:PORT/DB, got {state.shown!r}", file=sys.stderr)
        return 2

    async def publish() -> Any:
        try:
            return await ConfigStore(store).publish(bundle, 0, f"{default_owner()} (scheduler config publish)",
                                                    time.time(), "publish", signature)
        finally:
            await store.close()

    try:
        record = asyncio.run(publish())
    except StateUnavailable as exc:
        print(f"config publish: the state store ({state.shown}) cannot be written: {exc}", file=sys.stderr)
        return 2
    print(f"config version {record.version.label} published (signed by {signature.key_id}); routers that trust "
          "the key adopt it within their --config-sync-interval")
    return 0
