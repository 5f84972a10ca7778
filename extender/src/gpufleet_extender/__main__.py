from gpufleet_extender.cli import main

raise SystemExit(main())
