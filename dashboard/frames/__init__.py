"""Pure pandas transforms: source frames in, the tables the pages show out (no I/O, no Streamlit),
a module per topic (fleet, sharing, health, links, series, network, jobs) over the frame plumbing
of :mod:`dashboard.frames.columns`."""
