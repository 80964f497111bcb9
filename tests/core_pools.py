"""The slot pool the core's tests plan on, and its type ids."""

PDF, EXCEL, INDEX = 0, 1, 2


def seed_pool(core):
    """Three free slots of `core`'s SlotPool: 1 takes every type, 2 pdf and excel, 3 pdf alone.
    Slot ids run against specialisation so that only the type count can explain the choice."""
    p = core.SlotPool()
    p.add_slot(1, 100, [PDF, EXCEL, INDEX])
    p.add_slot(2, 100, [PDF, EXCEL])
    p.add_slot(3, 200, [PDF])
    return p
