"""qfold's analysis core: model source → decode variant → Core ML build → MIL walk → bytes → A/B diff.

This package never imports streamlit; the dashboard (app.py, app_pages/) and the CLI
(``python -m analyzer``) are thin shells over it.
"""

__version__ = "0.1.0"
