"""The command line of the cluster layer, all its argparse in one place:
the parser and error handling (main.py), `dlab node|send|consume|cluster`
(commands.py), `dlab image build` (image.py) and `dlab bench
catch-up|sync-master` (bench.py). `python -m cluster.cli` (__main__.py) runs
these without the chaos harness's commands; `dlab` (chaos/cli.py) adds them.

The top of the cluster layer: it may import every other subpackage, and
none imports it. Argument types shared with store/'s commands (sizes,
directories, UserError) are store/tools/cli_args.py."""
