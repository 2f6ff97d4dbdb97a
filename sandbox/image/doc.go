// Package image builds and imports the sandbox image without a container registry: debootstrap, apt-get in a chroot, docker import.
//
// One package list (packages.txt, embedded) drives both this builder and the
// Dockerfile next to it. The image tag is derived from that list and the
// builder's recipe, so a changed list means a new image, and the built root
// filesystem is cached as a tarball outside the repository so that a missing
// image costs only a docker import.
package image
