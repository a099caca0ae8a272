package objectfence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/leasefence/leasefence/fence"
)

// S3Client is the part of *s3.Client (github.com/aws/aws-sdk-go-v2/service/s3)
// that NewS3Store uses.
type S3Client interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, opts ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
	ListObjectsV2(ctx context.Context, in *s3.ListObjectsV2Input, opts ...func(*s3.Options)) (*s3.ListObjectsV2Output, error)
}

type s3Store struct {
	client S3Client
	bucket string
}

// NewS3Store is a Store on bucket through client: S3, or any server that
// speaks its API and honours If-Match and If-None-Match on PutObject
// (Check tells).
func NewS3Store(client S3Client, bucket string) (Store, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("objectfence: %w: nil S3 client", fence.ErrInvalidArgument)
	case bucket == "":
		return nil, fmt.Errorf("objectfence: %w: empty bucket", fence.ErrInvalidArgument)
	}
	return &s3Store{client: client, bucket: bucket}, nil
}

func (s *s3Store) Get(ctx context.Context, key string) ([]byte, string, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if err != nil {
		return nil, "", s3Error("get", key, err)
	}
	defer out.Body.Close()
	body, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, "", fmt.Errorf("get %q: %w", key, err)
	}
	return body, aws.ToString(out.ETag), nil
}

func (s *s3Store) Put(ctx context.Context, key string, body []byte, cond Condition) (string, error) {
	in := &s3.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body)))}
	if cond.IfMatch != "" {
		in.IfMatch = &cond.IfMatch
	}
	if cond.IfAbsent {
		in.IfNoneMatch = aws.String("*")
	}
	out, err := s.client.PutObject(ctx, in, noRetry)
	if err != nil {
		err = s3Error("put", key, err)
		if errors.Is(err, ErrNotFound) && cond.IfMatch != "" {
			// S3 answers If-Match on a missing object with 404 NoSuchKey.
			return "", fmt.Errorf("%w: %w", ErrPreconditionFailed, err)
		}
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// noRetry turns the client's retries off for one request, whatever
// retryer the caller's client was built with. A conditional put that
// landed but lost its answer (a 503, a closed connection), sent again,
// meets its own write and fails its condition: the fence would read that
// as "not written" when it was. Its outcome is unknown, and the fence
// says so rather than retry.
func noRetry(o *s3.Options) { o.Retryer = aws.NopRetryer{} }

func (s *s3Store) Delete(ctx context.Context, key string) error {
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil {
		if err = s3Error("delete", key, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

func (s *s3Store) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, s3Error("list", prefix, err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys, nil
}

// s3Error classifies a failed request by the store's answer: 412 and 409
// are a condition's, a missing key's 404 is ErrNotFound, any other 4xx a
// refusal. A 5xx, or no answer at all, leaves the outcome unknown.
func s3Error(op, key string, err error) error {
	var re *awshttp.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s %q: %w", op, key, err)
	}
	var code string
	if ae := smithy.APIError(nil); errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	status := re.HTTPStatusCode()
	switch {
	case status == 412:
		return fmt.Errorf("%s %q: %w: %w", op, key, ErrPreconditionFailed, err)
	case status == 409 && code == "ConditionalRequestConflict":
		return fmt.Errorf("%s %q: %w: %w", op, key, ErrConflict, err)
	case status == 404 && code != "NoSuchBucket":
		return fmt.Errorf("%s %q: %w: %w", op, key, ErrNotFound, err)
	case status >= 400 && status < 500:
		return fmt.Errorf("%s %q: %w: %w", op, key, ErrRefused, err)
	}
	return fmt.Errorf("%s %q: %w", op, key, err)
}
