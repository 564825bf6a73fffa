"""Generated from protos/scheduler/v1 by scripts/gen_protos.py; do not edit."""
