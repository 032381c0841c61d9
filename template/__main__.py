from template.cli import main

main()
