"""`python -m localllm` is the same as the `localllm` command."""

from localllm.cli import main

raise SystemExit(main())
