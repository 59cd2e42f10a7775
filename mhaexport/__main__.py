from mhaexport.cli import run

run()
