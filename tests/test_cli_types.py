"""A job type mistyped on the command line is refused naming the configured type it is
closest to, whether the job is queued or waited for."""

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"

[[worker]]
name = "excel"
types = ["excel"]
handler = "sup_handlers:echo"
"""


def test_submit_of_a_mistyped_type_suggests_the_configured_one(supervisors):
    # The types were listed, but the close one was not pointed out.
    sup = supervisors(ECHO).start()
    refused = "runs type 'pfd' (configured types: excel, pdf); did you mean 'pdf'?\n"
    for args in ((), ("--on-demand",)):
        result = sup.cli("submit", "pfd", *args)
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert result.stderr == f"fairsched: no worker group in {sup.config} {refused}", args
    # A type like none of them gets the list alone.
    result = sup.cli("submit", "video")
    assert (result.returncode, result.stderr) == (
        2, f"fairsched: no worker group in {sup.config} runs type 'video' (configured types: "
           "excel, pdf)\n")
    assert sup.cli("jobs", "--json").stdout == "[]\n"
