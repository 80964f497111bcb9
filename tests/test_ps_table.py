"""The `fairsched ps` table as a function of what `ps --json` gives (render_ps): its columns
line up whatever a handler says, and on a narrow terminal it leaves columns out or cuts them
short rather than wrap its rows. tests/test_cli_ps.py has the command on a real terminal."""

from fairsched.cli.common import display_width
from fairsched.cli.supervisor_cmds import render_ps

SUPERVISOR = {"pid": 4242, "uptime": 12.5, "database": "embedded", "database_connected": True,
              "lease_lost": False, "core": "c", "waiting_on_demand": 0, "shutting_down": False}


def slot(worker: str, slot_index: int, types, *, pid=31337, state="free", job_id=None,
         progress=None, message=None, restarts=0) -> dict:
    """One row of `ps --json`'s slots, process figures included."""
    busy = job_id is not None
    return {"worker": worker, "group": worker.rsplit("-", 1)[0], "pid": pid, "slot": slot_index,
            "types": list(types), "state": state, "job_id": job_id,
            "job_type": types[0] if busy else None, "job_age": 3.2 if busy else None,
            "attempt": 1 if busy else None, "progress": progress, "message": message,
            "cancelling": None, "restarts": restarts, "uptime": 61.0, "process_state": "running",
            "last_exit": None, "recovered": False, "fatal_reason": None,
            "rss": 52_000_000, "cpu": 1.25, "suspended": False}


def column_of(line: str, index: int) -> int:
    """The terminal column where character `index` of `line` is drawn."""
    return display_width(line[:index])


def test_a_progress_message_of_wide_characters_is_cut_to_its_columns_and_rows_line_up():
    # Each CJK character takes two terminal columns; past 30 columns the message is cut.
    data = {"supervisor": SUPERVISOR, "slots": [
        slot("says-1", 0, ["says"], pid=101, state="busy", job_id="od-1", progress=0.5,
             message="処理中ページ" * 8),
        slot("says-2", 0, ["says"], pid=102)]}
    header, *rows = render_ps(data).splitlines()[1:]
    busy = next(row for row in rows if "処理中" in row)
    assert display_width(busy[busy.index("50%"):busy.rindex("ジ") + 1]) <= 30, busy
    for row in rows:
        # RESTARTS starts where its header does, and so does every column after it.
        restarts = row.index(" 0 ", row.index("says", row.index("-") + 1)) + 1
        assert column_of(row, restarts) == column_of(header, header.index("RESTARTS")), (
            header, row)


def office(pid: int) -> dict:
    """The example's layout: a versatile worker of two slots, one running a job with
    progress."""
    types = ["pdf", "excel", "index"]
    return {"supervisor": SUPERVISOR, "slots": [
        slot("office-1", 0, types, pid=pid, state="busy", job_id="od-1", progress=0.5,
             message="page 2/5, figures"),
        slot("office-1", 1, types, pid=pid)]}


def test_on_a_narrow_terminal_columns_are_left_out_then_cut_short_rather_than_rows_wrapped():
    """On 80 columns the example's layout took 94 and more, every row wrapped; CPU, RSS and
    UPTIME go first, then PROGRESS and TYPES are cut short. Into a pipe, every column stays."""
    for pid in (7, 31337, 4194304):  # how much is cut depends on how wide the pids are
        data = office(pid)
        _, header, *rows = render_ps(data, width=80).splitlines()
        assert header.split() == ["WORKER", "PID", "SLOT", "TYPES", "STATE", "JOB", "AGE",
                                  "PROGRESS", "RESTARTS"], header
        assert all(display_width(line) <= 80 for line in [header, *rows]), rows
        busy = next(row for row in rows if " busy " in row)
        # PROGRESS is cut short first (to no fewer than 12 columns), then TYPES, as far as
        # the room needs.
        progress = busy[header.index("PROGRESS"):header.index("RESTARTS")].strip()
        types = busy[header.index("TYPES"):header.index("STATE")].strip()
        assert display_width(header) == 80, header
        assert progress.endswith("…") and len(progress) >= 12, busy
        assert "50% page 2/5, figures".startswith(progress[:-1]), busy
        if types != "pdf,excel,index":
            assert types.endswith("…") and len(types) >= 12, busy
            assert "pdf,excel,index".startswith(types[:-1]) and len(progress) == 12, busy
        piped = render_ps(data).splitlines()
        assert piped[1].split()[-3:] == ["UPTIME", "RSS", "CPU"], piped
        narrow = render_ps(data, width=60).splitlines()
        busy = next(row for row in narrow if " busy " in row)
        assert "pdf,excel,i… " in busy and "50% page 2/… " in busy, busy


def test_a_process_being_recycled_is_said_below_the_table_with_its_memory_against_the_limit():
    row = slot("pdf-1", 0, ["pdf"], state="stopping", pid=77)
    row.update(rss=380 << 20, max_rss=400 << 20, recycling="max_rss: RSS 412MB above 400MB")
    other = slot("pdf-2", 0, ["pdf"], pid=78)
    other.update(rss=41 << 20, rss_limit=1536 << 20)
    plain = slot("ocr-1", 0, ["ocr"], pid=79)
    lines = render_ps({"supervisor": SUPERVISOR, "slots": [row, other, plain]}).splitlines()
    header = lines[1]
    rss = {line.split()[0]: line[header.index("RSS"):].split()[0] for line in lines[2:5]}
    assert rss == {"pdf-1": "380.0M/400M", "pdf-2": "41.0M/1.5G", "ocr-1": "49.6M"}, lines
    assert lines[5:] == ["pdf-1 is being recycled: max_rss: RSS 412MB above 400MB"], lines
def test_processes_a_reload_retires_are_said_below_the_table():
    replaced = dict(slot("pdf-1", 0, ["pdf"], state="stopping", job_id=17), retiring="replaced")
    removed = dict(slot("ocr-1", 0, ["ocr"], state="stopping"), retiring="removed")
    kept = dict(slot("pdf-2", 0, ["pdf"]), retiring=None)
    notes = render_ps({"supervisor": SUPERVISOR,
                       "slots": [replaced, kept, removed]}).splitlines()[5:]
    assert notes == [
        "pdf-1 is being replaced with its group's new settings (a reload): it stops once its "
        "jobs end",
        "ocr-1 is leaving: its group left workers.toml in a reload (it stops once its jobs end)"]
