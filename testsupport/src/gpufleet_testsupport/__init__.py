"""Set-up shared by gpufleet.mig's suites (tests/, extender/tests, lab/tests) and benchmarks: one copy each of a free
port, a wait, a local HTTP server, the Prometheus launcher and stand-ins, the fake kubelet, the control plane and the
dcgm-exporter text. Imported as `gpufleet_testsupport.<module>`; `make venv` installs it editable."""
