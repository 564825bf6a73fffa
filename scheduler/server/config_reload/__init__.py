"""Hot reload of the router's config (regions/, policies/, the keys file, the budgets file),
and one config version for every router that shares the store.

Triggers: ``SIGHUP``, a change of any of the files (their mtime, size or inode, checked every
``watch_interval_s``; a Kubernetes ConfigMap or Secret update swaps a symlink) and the admin RPC
``RouterAdmin/ReloadConfig`` (``scheduler config reload --router ADDR``). Each reads every file
once into a ``ConfigBundle`` (the texts) and validates the bundle as a whole, with the loaders
the router starts with (``scheduler.config.loader``: every problem named by file, field and
value; the keys file; the budgets file; the policy named by ``--policy``; a ticket key for every
region). A bundle with any problem changes nothing: the version in use stays, and each problem
goes to the log (ERROR), to ``/metrics`` (``scheduler_config_problem{file,field,message}``) and
into the RPC's answer. All or nothing: one bad file keeps every file's last good version.

Versions. A bundle's content hash (sha256 of its files, ``ConfigBundle.digest``) and a counter
that only grows make its version, ``<counter>-<hash[:12]>`` (``local-<hash[:12]>`` while not
yet published). The store holds them (``scheduler.state`` keys, relative):

- ``config:version:<n>``: version n, its bundle, who published it and when. Written once,
  with SET NX: two routers cannot both claim n. The last ``KEEP_VERSIONS`` are kept.
- ``config:head``: ``{counter, digest}`` of the newest version (a pointer, read every
  ``sync_interval_s`` by every router; small).
- ``config:digest:<hash>``: marks a bundle as published once (the start-up rule below).

A router that reloads a valid bundle that differs from the one in use claims the next
counter, writes its version and moves the head: its files become the fleet's config (the last
publication wins; a collision on a counter moves the later publisher to the next one). A file
change or SIGHUP does so only when the files' content changed since this router last read them
(a router with stale files does not revert the fleet on a touch or a fleet-wide SIGHUP); the
RPC does so whenever they differ from the version in use (a rollback to them). Every
router's sync loop reads the head (and version ``n + 1`` beside it, which repairs a head that
two racing publishers left one behind), validates a newer version's bundle the same way and
adopts it: every router converges within ``sync_interval_s`` plus a validation (1 s + ~0.1 s).
A version that fails validation on a router (e.g. a region it has no ticket key for) is not
adopted there: that router keeps its version and reports the problems, once per version.

Signatures (``scheduler.server.config_signing``). Whoever can write the store could publish a
version, so a router adopts one only when it is signed by an operator key it trusts
(``ConfigTrust``: ``--config-trust``), and refuses the rest: no signature, an unknown key id, a
bad signature, a hash that does not match the files, a malformed record, one signed before the
version in use (a replay), or files that fail validation. A refused record keeps the version in
use; it is logged once per distinct bundle, counted (``scheduler_config_rejected_total{reason}``)
and shown by ``RouterAdmin/GetStatus``. A router publishes its own files only with a signature
that verifies (``--config-signature``, written by ``scheduler config sign``); operators publish
straight to the store with ``scheduler config publish``. Three modes:

- signed (trusted keys): as above; a reload of this router's own files needs their signature
  (unsigned files serve only from the start until the store offers a signed version);
- standalone (no key, the default): the router runs on its own files and reloads them, but
  neither publishes nor adopts versions (every store record is refused);
- ``allow_unsigned`` (``--config-allow-unsigned``, development): unsigned versions are
  published and adopted as before signing existed; signed ones must still verify.

A version must also keep the router usable: a key list that is empty, or that has no admin key
while the keys in use have one, is refused (``auth.key_ring_issues``), from a file as from the
store.

Parts: a router uses the parts it was started with. A version that lacks one of them (no
keys file for a router that authenticates, no budgets file for one that enforces budgets) is
refused: a store record never turns authentication or budgets off. Parts a router was not
started with are ignored (an ``--insecure`` router does not start authenticating).

Start-up: the router validates its own files (a bad file stops it, as before) and then
- the store has no version: it publishes its files;
- the head has the same content: it takes the head's version;
- its files were published before and another version followed (an old replica restarting
  with old files): it adopts the head, it does not revert the fleet;
- its files were never published (a new rollout): it publishes them, and they become the
  fleet's version.

While the store is unreachable a router keeps serving on its last good config. A reload then
applies locally at once (version ``local-<hash>``) and is published when the store answers
again (it is then the newest version: the last publication wins); a router started during an
outage runs on its own files and joins as above when the store answers.

Applying a version swaps the snapshot whole (a new ``SnapshotBuilder`` over the new regions and
policy, labelled with the version; the refresher reads the store for the new regions first),
then, in the same step of the event loop, the key ring and the ledger's budgets and critical
classes; the region probes and carbon pollers then follow the new regions. A request in flight finishes on the
snapshot it was decided on, and its decision and receipt carry that snapshot's version
(``FleetSnapshot.config_version``). Not reloaded: ``--policy`` (the name), the ticket keys, TLS,
ports and the other command-line settings.

The package, by concern: ``sources`` (where the files are, the bundle they make, its version
label, a validated bundle), ``store`` (the versions in the shared store), ``reloader`` (the
triggers, publishing, adopting and applying a version) and ``metrics`` (the reloader's samples
on /metrics).
"""
