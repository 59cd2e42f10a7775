"""The command line's verbs, one module per verb group, each parse, call the API, print; :mod:`mhaexport.cli` is the
group that registers them (``from mhaexport.cli import main``)."""
