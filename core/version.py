"""mhaexport's version: on the ground floor (core), so the records that name it (env, reports, manifests) need not
import the package's facade (mhaexport/__init__.py re-exports the API above every layer)."""

__version__ = "0.1.0"
