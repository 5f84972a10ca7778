"""One router per endpoint group: ``scheduler`` (kube-scheduler's verbs) and ``health`` (probes, metrics)."""
