from gpufleet_extender.simulate.cli import main

raise SystemExit(main())
