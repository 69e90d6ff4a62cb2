"""Pure chart builders: a DataFrame in, a Vega-Lite specification out (no I/O, no Streamlit), a
module per page topic over the shared plumbing of :mod:`dashboard.figures.vega` and the colours of
:mod:`dashboard.figures.palette`.

Each function returns a plain Vega-Lite v5 spec (a dict) with its rows in a named dataset; the
pages draw it with ``st.vega_lite_chart`` (dashboard/ui.py ``chart``). Vega-Lite, not Plotly:
Streamlit ships both, but a browser that opens a page with a Plotly chart first downloads and
evaluates a bundle several times the size of Vega-Lite's, before anything is drawn;
docs/benchmarks.md ("Vega-Lite charts, a page's queries sent at once") has the MB and the seconds.
"""
