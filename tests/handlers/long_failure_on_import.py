"""A handler module whose import fails with a long message, in more than ASCII (escaped as
JSON, six bytes a character)."""

raise RuntimeError("the settings file is not valid: " + "é" * 30000)
