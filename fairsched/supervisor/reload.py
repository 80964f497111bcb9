"""What a reload of workers.toml changes (`fairsched reload`, SIGHUP): the difference between
the configuration running and the one just loaded, decided here as a function of the two, and
said in one line per group. Whether it may be applied without a restart is decided here too;
the components apply it (Supervisor.reload)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from fairsched.config import Config, ScheduleSpec, WorkerSpec
from fairsched.errors import ConfigError, path_name

# [supervisor] keys a running supervisor cannot take on: where its state and database are, the
# lease its database connections and the other supervisors rely on, the metrics listener,
# the prune lane, the worker logs' rotation and the web dashboard, all set up once at start.
RESTART_KEYS = ("state_dir", "database", "lease", "heartbeat_interval", "metrics",
                "prune_after", "log_max_bytes", "log_backups", "web", "web_token")
# [supervisor] keys a reload applies: read again at each use.
APPLIED_KEYS = ("shutdown_timeout", "poll_interval")
# [scoring] keys by the Weights field each sets.
SCORING_KEYS = {"priority": "priority_weight", "age": "age_weight", "rarity": "rarity_weight",
                "on_demand": "on_demand_bonus", "on_demand_age": "on_demand_age_weight"}
# [[worker]] keys whose change needs no new process: the group only grows or shrinks.
# Keys whose change takes no new process: the group is resized (to `processes`, or, for an
# autoscaled group, its current size kept within the new range), the others run on.
RESIZE_ONLY = frozenset({"processes", "max_processes", "idle_timeout"})


@dataclass(frozen=True)
class ConfigChange:
    """What a reload changes: groups added, removed, changed (with the keys), unchanged; the
    [scoring] and [supervisor] keys that changed."""

    added: tuple[WorkerSpec, ...] = ()
    removed: tuple[str, ...] = ()
    changed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()
    scoring: tuple[str, ...] = ()
    supervisor: tuple[str, ...] = ()
    schedules: tuple[str, ...] = ()  # "NAME added", "NAME removed", "NAME changed"

    @property
    def nothing(self) -> bool:
        return not (self.added or self.removed or self.changed or self.scoring
                    or self.supervisor or self.schedules)

    def lines(self) -> list[str]:
        """What changed, one line per group (the unchanged ones in one), then scoring and
        supervisor settings: what `fairsched reload` prints and the supervisor logs."""
        said = [f"group {spec.name}: added ({spec.processes} process"
                f"{'' if spec.processes == 1 else 'es'}, types {', '.join(spec.types)})"
                for spec in self.added]
        said += [f"group {name}: removed (its processes stop once their jobs end)"
                 for name in self.removed]
        for name, keys in self.changed.items():
            how = ("resized" if set(keys) <= RESIZE_ONLY
                   else "changed, its processes replaced one at a time")
            said.append(f"group {name}: {how} ({', '.join(keys)})")
        if self.unchanged:
            said.append(f"unchanged: {len(self.unchanged)} group"
                        f"{'' if len(self.unchanged) == 1 else 's'} "
                        f"({', '.join(self.unchanged)})")
        if self.scoring:
            said.append(f"scoring changed ({', '.join(self.scoring)}): from the next cycle")
        if self.supervisor:
            said.append(f"supervisor settings changed ({', '.join(self.supervisor)})")
        if self.schedules:
            said.append(f"schedules: {', '.join(self.schedules)} (from the next check)")
        if self.nothing:
            said.append("nothing changed")
        return said

    def as_json(self) -> dict:
        return {"added": [spec.name for spec in self.added], "removed": list(self.removed),
                "changed": {name: list(keys) for name, keys in self.changed.items()},
                "unchanged": list(self.unchanged), "scoring": list(self.scoring),
                "supervisor": list(self.supervisor), "schedules": list(self.schedules),
                "lines": self.lines()}


def config_change(old: Config, new: Config) -> ConfigChange:
    """What loading `new` over the running `old` changes; ConfigError, one line naming the
    file and the key, when it changes a setting that takes a restart (nothing is changed)."""
    for key in RESTART_KEYS:
        if getattr(old.supervisor, key) != getattr(new.supervisor, key):
            raise ConfigError(f"{path_name(new.path)}: [supervisor] key {key!r} changed: that "
                              "takes a restart of the supervisor (`fairsched stop`, then "
                              "`fairsched supervise`); nothing was reloaded")
    before = {spec.name: spec for spec in old.workers}
    after = {spec.name: spec for spec in new.workers}
    changed = {}
    unchanged = []
    for name, spec in after.items():
        if name in before:
            keys = spec_changes(before[name], spec)
            if keys:
                changed[name] = keys
            else:
                unchanged.append(name)
    scoring = tuple(SCORING_KEYS[f.name] for f in fields(old.scoring)
                    if getattr(old.scoring, f.name) != getattr(new.scoring, f.name))
    if old.matching != new.matching:
        scoring += ("matching",)
    return ConfigChange(
        added=tuple(spec for name, spec in after.items() if name not in before),
        removed=tuple(name for name in before if name not in after),
        changed=changed, unchanged=tuple(unchanged), scoring=scoring,
        supervisor=tuple(key for key in APPLIED_KEYS
                         if getattr(old.supervisor, key) != getattr(new.supervisor, key)),
        schedules=schedule_changes(old.schedules, new.schedules))


def schedule_changes(old: tuple[ScheduleSpec, ...],
                     new: tuple[ScheduleSpec, ...]) -> tuple[str, ...]:
    """The [[schedule]] names added, removed or changed. A changed schedule keeps its last due
    time (the table's row, by name): its next job is at its next due time."""
    before = {spec.name: spec for spec in old}
    after = {spec.name: spec for spec in new}
    said = [f"{name} added" if name not in before else f"{name} changed"
            for name, spec in after.items() if before.get(name) != spec]
    return tuple(said + [f"{name} removed" for name in before if name not in after])


def spec_changes(old: WorkerSpec, new: WorkerSpec) -> tuple[str, ...]:
    """The [[worker]] keys whose value differs, in the order WorkerSpec has them."""
    return tuple(f.name for f in fields(WorkerSpec)
                 if getattr(old, f.name) != getattr(new, f.name))
