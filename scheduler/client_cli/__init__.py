"""The commands that talk to a running router through the SDK (``scheduler admin``,
``scheduler config reload``). Apart from ``scheduler.client`` because they use the CLI's config
helpers, which the SDK, shipped alone, does not carry."""
