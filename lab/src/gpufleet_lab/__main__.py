from gpufleet_lab.cli import main

raise SystemExit(main())
