from gpufleet_extender.cli import main

if __name__ == "__main__":  # not when a spawned worker process imports the main module
    raise SystemExit(main())
