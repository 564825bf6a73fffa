"""A capacity plan as data: the plan file ``scheduler plan --json`` writes, read back into a
daily schedule of warm replicas per pool (``schedule``), and the Ray Serve autoscaling windows
it implies. The planner that makes plans is ``scheduler.capacity``; this part imports nothing
from it, nor from the simulator, so that both can read plans."""
