"""``hsextract plan``: what a run will cost, from the dataset itself, before anything starts.

`scan` reads the dataset through the client's own reader and encoder (every core), `estimate`
turns what it found into bytes per format, staging space, time and the output volume's verdict,
`command` prints it and writes it as JSON, and `report` is that report as one typed record (what
``plan.json`` holds).
"""
