package kube

import (
	"context"
	"time"
)

// fill keeps Config.Warm connected warm pods of this replica.
func (b *Backend) fill() {
	defer b.wg.Done()
	backoff := time.Second
	for {
		b.mu.Lock()
		need := !b.closed && len(b.warm)+b.filling < b.cfg.Warm
		if need {
			b.filling++
		}
		b.mu.Unlock()
		if !need {
			select {
			case <-b.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		go func() {
			select {
			case <-b.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		pc, err := b.warmPod(ctx)
		cancel()
		b.mu.Lock()
		b.filling--
		if err == nil && !b.closed {
			b.warm = append(b.warm, pc)
			pc = nil
		}
		b.mu.Unlock()
		if pc != nil { // closed meanwhile
			pc.close()
			b.deletePod(pc.name, "")
		}
		if err != nil {
			if b.isClosed() {
				return
			}
			b.log.Warn("warm pool: start pod", "err", err, "retry_in", backoff)
			select {
			case <-b.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Minute)
			continue
		}
		backoff = time.Second
	}
}

// warmPod creates one warm pod and connects to its kernel.
func (b *Backend) warmPod(ctx context.Context) (*podConn, error) {
	name, err := b.createPod(ctx, b.cfg.Defaults, b.cfg.Image, "")
	if err != nil {
		return nil, err
	}
	pc, err := b.connect(ctx, name, false, b.cfg.Defaults)
	if err != nil {
		b.deletePod(name, "")
		return nil, err
	}
	return pc, nil
}

// Pooled returns how many connected warm pods this replica holds.
func (b *Backend) Pooled() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.warm)
}
