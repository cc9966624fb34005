"""``hsextract regenerate``: the served model rewrites every assistant turn of a dataset (on-policy data)."""
