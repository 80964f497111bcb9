"""The supervisor: one asyncio actor that owns workers, slots, running jobs and requests."""
