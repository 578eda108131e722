"""`python -m mlx_dflash.serve`: the server's CLI, which lives in server/cli.py."""

from .server.cli import main

if __name__ == "__main__":
    main()
