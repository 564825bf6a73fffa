"""Regions on Ray Serve: one application per region (RegionGateway + vLLM replicas), the
live-state publisher, and the local stack behind ``scheduler up``.

Kept free of imports: the ``scheduler`` command must not load Ray to parse its arguments.
"""

# The regions `scheduler up` deploys by default: one per continent, sized for a 2-core,
# 24 GiB machine (each local region runs its own vLLM CPU engine).
DEFAULT_LOCAL_REGIONS = ("us-east", "eu-north", "ap-northeast")
