from gpu_arbiter.cli.main import main

main()
