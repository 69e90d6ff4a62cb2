"""Pure chart builders: a DataFrame in, a Vega-Lite specification out (no I/O, no Streamlit), a
module per page topic over the shared plumbing of :mod:`dashboard.figures.vega` and the colours of
:mod:`dashboard.figures.palette`.

Each function returns a plain Vega-Lite v5 spec (a dict) with its rows in a named dataset; the
pages draw it with ``st.vega_lite_chart`` (dashboard/ui.py ``chart``). Vega-Lite, not Plotly:
Streamlit ships both, but a browser that opens a page with a Plotly chart first downloads and
evaluates a 4.7 MB bundle (0.6 s of one core's time here, before anything is drawn), Vega-Lite's is
0.8 MB; docs/benchmarks.md has the measurement.
"""
