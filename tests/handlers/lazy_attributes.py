"""A handler module whose attributes are made on first use (PEP 562), and fail to be."""


def __getattr__(name: str):
    raise RuntimeError(f"the model behind {name!r} could not be loaded")
