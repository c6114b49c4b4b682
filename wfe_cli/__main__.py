from wfe_cli import main

main()
