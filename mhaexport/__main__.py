from mhaexport.cli import main

main()
