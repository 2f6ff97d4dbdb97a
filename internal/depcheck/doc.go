// Package depcheck holds the test that keeps Triad's layers reading top-down: no package imports one above it.
package depcheck
