package s3_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/s3"
)

// A store over a MinIO bucket, configured the way `triad serve --store s3`
// is (scripts/minio.sh start prints these variables). It is compiled but not
// run, because it needs a server.
func ExampleNew() {
	ctx := context.Background()
	blobs, index, err := s3.New(ctx, s3.Config{
		Endpoint:  os.Getenv("TRIAD_S3_ENDPOINT"), // e.g. http://127.0.0.1:9000
		Bucket:    os.Getenv("TRIAD_S3_BUCKET"),
		AccessKey: os.Getenv("TRIAD_S3_ACCESS_KEY"),
		SecretKey: os.Getenv("TRIAD_S3_SECRET_KEY"),
		Region:    os.Getenv("TRIAD_S3_REGION"),
	})
	if err != nil {
		log.Fatal(err) // errors.Is(err, tmpfs.ErrUnavailable) when S3 does not answer
	}
	defer blobs.Close()
	store := tmpfs.New(blobs, index, nil)
	f, err := store.Write(ctx, runid.New(), "notes/hello.txt", strings.NewReader("hello"), 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(f.Path, f.Size, f.SHA256)
}
