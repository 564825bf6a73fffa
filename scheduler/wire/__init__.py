"""What the router, the regions and the SDK share on the wire: the plain records a receipt is
made of (``records``), reading a region's receipt claims (``claims``), the records as protobuf
messages (``proto``), the chat messages of an engine body (``engine_body``), the header names
(``headers``) and the retry policy of a call that may pass when tried again (``retry``: the SDK's
calls to the router, the data layer's to the carbon providers).

The SDK (``scheduler.client``, shipped alone as ``carbon-scheduler-sdk``) imports this package
and never the router: nothing here imports ``scheduler.server``, ``serve``, ``datalayer``,
``framework``, ``config`` or ``sim``, nor anything beyond the standard library, protobuf and
two pure modules (``scheduler.errors``, ``scheduler.energy.output_budget``);
tests/unit/test_import_layers.py holds it to that.
"""
