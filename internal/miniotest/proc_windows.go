package miniotest

import "os"

const sharedPrefix = "triad-miniotest-"

// terminate stops MinIO; Windows has no SIGTERM, so it is killed.
func terminate(p *os.Process) error { return p.Kill() }

func sweepStale() {}
