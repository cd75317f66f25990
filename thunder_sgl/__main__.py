from thunder_sgl.cli import main

main()
