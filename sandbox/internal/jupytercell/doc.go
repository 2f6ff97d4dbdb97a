// Package jupytercell runs one cell on an ipykernel over Jupyter for the
// backends that speak Jupyter (sandbox/docker and sandbox/kube): it sends
// the cell, delivers its output message by message within the cell's output
// limit, interrupts it over the control channel on a timeout or hang-up,
// restarts a wedged kernel, and reports a dead one. How a backend reaches,
// restarts and diagnoses its kernel is behind Kernel.
package jupytercell
