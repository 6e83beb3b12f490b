from gpuflex.cli.main import run

run()
