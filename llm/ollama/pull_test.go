package ollama

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/tinymodel"
)

type blob struct {
	mediaType string
	data      []byte
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// fakeRegistry serves one model, library/tiny:latest, the way an Ollama
// registry does: a manifest, and blobs behind a redirect to a "direct" URL
// on another host name (localhost), as Ollama's downloader requires.
func fakeRegistry(t *testing.T, layers []blob, config []byte) (addr string, blobGets *atomic.Int32) {
	t.Helper()
	blobGets = new(atomic.Int32)
	byDigest := map[string][]byte{digestOf(config): config}
	type layer struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int    `json:"size"`
	}
	man := struct {
		SchemaVersion int     `json:"schemaVersion"`
		MediaType     string  `json:"mediaType"`
		Config        layer   `json:"config"`
		Layers        []layer `json:"layers"`
	}{2, "application/vnd.docker.distribution.manifest.v2+json",
		layer{"application/vnd.docker.container.image.v1+json", digestOf(config), len(config)}, nil}
	for _, l := range layers {
		d := digestOf(l.data)
		byDigest[d] = l.data
		man.Layers = append(man.Layers, layer{l.mediaType, d, len(l.data)})
	}
	manJSON, _ := json.Marshal(man)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/library/tiny/manifests/latest":
			w.Header().Set("Content-Type", man.MediaType)
			w.Write(manJSON)
		case strings.HasPrefix(r.URL.Path, "/v2/library/tiny/blobs/"):
			d := strings.TrimPrefix(r.URL.Path, "/v2/library/tiny/blobs/")
			data, ok := byDigest[d]
			if !ok {
				http.NotFound(w, r)
				return
			}
			if r.Method == http.MethodGet && r.Host != "localhost:"+itoa(port) {
				http.Redirect(w, r, "http://localhost:"+itoa(port)+"/direct/"+d, http.StatusTemporaryRedirect)
				return
			}
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		case strings.HasPrefix(r.URL.Path, "/direct/"):
			data, ok := byDigest[strings.TrimPrefix(r.URL.Path, "/direct/")]
			if !ok {
				http.NotFound(w, r)
				return
			}
			blobGets.Add(1)
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().String(), blobGets
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestRealEnsureModelPullsByName(t *testing.T) {
	ollama.ForEach(t, testRealEnsureModelPullsByName)
}

func testRealEnsureModelPullsByName(t *testing.T, inst *ollamatest.Instance) {
	var gguf bytes.Buffer
	if err := tinymodel.Write(&gguf, tinymodel.Options{Seed: 99}); err != nil {
		t.Fatal(err)
	}
	params, _ := json.Marshal(tinymodel.Parameters())
	config := []byte(`{"model_format":"gguf","model_family":"llama","model_families":["llama"],"model_type":"166K","file_type":"F32","architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	addr, blobGets := fakeRegistry(t, []blob{
		{"application/vnd.ollama.image.model", gguf.Bytes()},
		{"application/vnd.ollama.image.template", []byte(tinymodel.Template)},
		{"application/vnd.ollama.image.params", params},
	}, config)

	name := addr + "/library/tiny"
	b, err := New(Config{BaseURL: inst.URL, Model: name, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.EnsureModel(ctx, ModelSource{}); err == nil {
		t.Fatal("pulled over plain HTTP without Insecure")
	}
	var statuses []string
	var bytesDone bool
	progress := func(status string, completed, total int64) {
		if len(statuses) == 0 || statuses[len(statuses)-1] != status {
			statuses = append(statuses, status)
		}
		bytesDone = bytesDone || (total == int64(gguf.Len()) && completed == total)
	}
	if err := b.EnsureModel(ctx, ModelSource{Insecure: true, Progress: progress}); err != nil {
		t.Fatalf("pull: %v", err)
	}
	if blobGets.Load() == 0 {
		t.Fatal("no blob was downloaded from the registry")
	}
	// Progress as Ollama reports it: the manifest, then each layer with
	// its bytes, then success.
	if len(statuses) < 3 || statuses[0] != "pulling manifest" || statuses[len(statuses)-1] != "success" || !bytesDone {
		t.Fatalf("pull progress %q (model layer completed: %v)", statuses, bytesDone)
	}
	got := blobGets.Load()
	if err := b.EnsureModel(ctx, ModelSource{Insecure: true}); err != nil {
		t.Fatal(err)
	}
	if blobGets.Load() != got {
		t.Fatal("second EnsureModel pulled again")
	}
	if _, err := b.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	if _, final := generate(t, b, llm.Options{MaxTokens: ptr(4)}); final.CompletionTokens != 4 {
		t.Fatalf("chat with the pulled model: %+v", final)
	}
}
