"""Streamlit page scripts, run by st.navigation from app.py (not imported; not named pages/ because that
folder name switches Streamlit to its legacy multipage mode, which skips app.py)."""
