"""Pure-Python twin of _pool_c: the slot pool, indexed by type, most specialised slot first."""

from array import array
from bisect import bisect_left

from fairsched.core._checks import as_int64, check_slot_id, check_type_ids


def _specialisation(slot):
    return slot.n_types, slot.slot_id


class _Slot:
    __slots__ = ("slot_id", "worker_id", "types", "n_types", "busy", "live")

    def __init__(self, slot_id, worker_id, types):
        self.slot_id = slot_id
        self.worker_id = worker_id
        self.types = types
        self.n_types = len(types)
        self.busy = False
        self.live = True


class SlotPool:
    """Execution slots of live workers; which are free, per job type.

    Per type id the pool keeps that type's slots ordered by specialisation (fewest types,
    then lowest slot id), a hint below which every slot is busy, and a free counter.
    Acquiring only moves a hint forward, so a whole planning cycle scans each type's slots
    at most once; releasing moves the hint back to the released slot.
    """

    __slots__ = ("_slots", "_index", "_hint", "_free", "_n_free")

    def __init__(self):
        self._slots = {}  # slot id -> _Slot
        self._index = []  # per type id: its slots, most specialised first
        self._hint = []  # per type id: every position below it holds a busy slot
        self._free = []  # per type id: free slots supporting it
        self._n_free = 0

    def add_slot(self, slot_id, worker_id, type_ids):
        """Add a free slot of a worker, able to run the given (interned) type ids."""
        slot_id = check_slot_id(slot_id)
        worker_id = as_int64(worker_id, "worker id")
        types = check_type_ids(type_ids)
        if slot_id in self._slots:
            raise ValueError(f"slot {slot_id} already exists")
        grow = max(types) + 1 - len(self._index)
        if grow > 0:
            self._index.extend([] for _ in range(grow))
            self._hint.extend([0] * grow)
            self._free.extend([0] * grow)
        slot = _Slot(slot_id, worker_id, types)
        key = (slot.n_types, slot_id)
        for t in types:
            slots = self._index[t]
            pos = bisect_left(slots, key, key=_specialisation)
            slots.insert(pos, slot)
            if pos < self._hint[t]:
                self._hint[t] = pos
            self._free[t] += 1
        self._slots[slot_id] = slot
        self._n_free += 1

    def acquire(self, type_id):
        return self._take(as_int64(type_id, "type id"))

    def _take(self, type_id):
        if type_id < 0 or type_id >= len(self._free) or not self._free[type_id]:
            return -1
        slots = self._index[type_id]
        pos = self._hint[type_id]
        while slots[pos].busy:
            pos += 1
        self._hint[type_id] = pos + 1
        slot = slots[pos]
        self._occupy(slot)
        return slot.slot_id

    def _occupy(self, slot):
        slot.busy = True
        self._n_free -= 1
        free = self._free
        for t in slot.types:
            free[t] -= 1

    def acquire_slot(self, slot_id):
        slot = self._slots.get(slot_id)
        if slot is None or slot.busy:
            return False
        self._occupy(slot)
        return True

    def release(self, slot_id):
        slot = self._slots.get(slot_id)
        if slot is None or not slot.busy:
            return False
        slot.busy = False
        self._n_free += 1
        key = (slot.n_types, slot.slot_id)
        for t in slot.types:
            self._free[t] += 1
            pos = bisect_left(self._index[t], key, key=_specialisation)
            if pos < self._hint[t]:
                self._hint[t] = pos
        return True

    def remove_worker(self, worker_id):
        worker_id = as_int64(worker_id, "worker id")
        gone = [slot for slot in self._slots.values() if slot.worker_id == worker_id]
        touched = set()
        for slot in gone:
            del self._slots[slot.slot_id]
            slot.live = False
            touched.update(slot.types)
            if not slot.busy:
                self._n_free -= 1
                for t in slot.types:
                    self._free[t] -= 1
        for t in touched:
            hint = self._hint[t]
            kept = []
            new_hint = 0
            for pos, slot in enumerate(self._index[t]):
                if slot.live:
                    if pos < hint:
                        new_hint += 1
                    kept.append(slot)
            self._index[t] = kept
            self._hint[t] = new_hint
        return sorted(slot.slot_id for slot in gone if slot.busy)

    def free_count(self, type_id):
        type_id = as_int64(type_id, "type id")
        if 0 <= type_id < len(self._free):
            return self._free[type_id]
        return 0

    def free_counts(self, n_types):
        n_types = as_int64(n_types, "n_types")
        if n_types < 0:
            raise ValueError(f"n_types must be >= 0, got {n_types}")
        out = array("q", self._free[:n_types])
        if len(out) < n_types:
            out.extend([0] * (n_types - len(out)))
        return out

    def has_slot(self, slot_id):
        return slot_id in self._slots

    def is_busy(self, slot_id):
        # A slot that vanished with its worker is not busy: releasing it is a no-op.
        slot = self._slots.get(slot_id)
        return slot is not None and slot.busy

    def slot_types(self, slot_id):
        return self._get(slot_id).types

    def worker_of(self, slot_id):
        return self._get(slot_id).worker_id

    def slot_ids(self):
        return sorted(self._slots)

    def _get(self, slot_id):
        try:
            return self._slots[slot_id]
        except (KeyError, TypeError):
            raise KeyError(f"no slot {slot_id!r} in the pool") from None

    def __len__(self):
        return len(self._slots)

    @property
    def n_free(self):
        return self._n_free

    @property
    def n_type_ids(self):
        """Highest type id the pool has seen, plus one: the length free_counts() needs."""
        return len(self._index)

    def __repr__(self):
        return f"<SlotPool (python): {len(self)} slots, {self._n_free} free>"
