from formats.conftest import readers  # noqa: F401  (the trainers' reader installs, shared with tests/formats)
