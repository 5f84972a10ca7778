from gpufleet_lab.simulate.cli import main

raise SystemExit(main())
