from template.commands import main

main()
