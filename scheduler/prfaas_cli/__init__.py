"""The ``prfaas`` command: the one place that imports every shell and wires it to the core."""
