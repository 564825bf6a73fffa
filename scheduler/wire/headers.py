"""HTTP header names the router, the regions and the SDK agree on."""

# The router's signed dispatch ticket (scheduler.tickets), on every request sent to a region.
TICKET_HEADER = "x-scheduler-ticket"
