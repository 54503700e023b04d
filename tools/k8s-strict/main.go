// k8s-strict decodes every YAML document of a file into the real Kubernetes API types, the way a strict client
// does: an unknown or misspelt field, a duplicated key, a malformed quantity ("1.5 cores", "12Gx") or an update
// mode the VPA API does not declare is an error naming the document. ai4dl's tests run it on what
// `ai4dl recommendations` writes, so an object that could not be applied fails there, not at kubectl.
//
//	k8s-strict [-as Kind] FILE    (FILE "-" or absent: standard input)
//
// Each document is decoded as its own "kind" (VerticalPodAutoscaler, Pod, Deployment, StatefulSet, Job), or as
// -as Kind for documents that are patches without one (a Deployment's pod-template patch, a Pod resize body).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	vpav1 "k8s.io/autoscaler/vertical-pod-autoscaler/pkg/apis/autoscaling.k8s.io/v1"
	"sigs.k8s.io/yaml"
)

var updateModes = map[vpav1.UpdateMode]bool{
	vpav1.UpdateModeOff: true, vpav1.UpdateModeInitial: true, vpav1.UpdateModeRecreate: true,
	vpav1.UpdateModeAuto: true, vpav1.UpdateModeInPlaceOrRecreate: true, vpav1.UpdateModeInPlace: true,
}

func target(kind string) (interface{}, error) {
	switch kind {
	case "VerticalPodAutoscaler":
		return &vpav1.VerticalPodAutoscaler{}, nil
	case "Pod":
		return &corev1.Pod{}, nil
	case "Deployment":
		return &appsv1.Deployment{}, nil
	case "StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "Job":
		return &batchv1.Job{}, nil
	}
	return nil, fmt.Errorf("unknown kind %q (known: VerticalPodAutoscaler, Pod, Deployment, StatefulSet, Job)", kind)
}

// check is what the API server's validation (the VPA CRD's schema) would refuse beyond decoding.
func check(obj interface{}) error {
	vpa, ok := obj.(*vpav1.VerticalPodAutoscaler)
	if !ok {
		return nil
	}
	if vpa.Spec.TargetRef == nil || vpa.Spec.TargetRef.Kind == "" || vpa.Spec.TargetRef.Name == "" {
		return fmt.Errorf("spec.targetRef needs a kind and a name")
	}
	if p := vpa.Spec.UpdatePolicy; p != nil && p.UpdateMode != nil && !updateModes[*p.UpdateMode] {
		return fmt.Errorf("spec.updatePolicy.updateMode %q is not one of Off, Initial, Recreate, Auto, InPlaceOrRecreate, InPlace", *p.UpdateMode)
	}
	return nil
}

func main() {
	as := flag.String("as", "", "decode every document as this kind (default: each document's own kind)")
	flag.Parse()
	var in io.Reader = os.Stdin
	if name := flag.Arg(0); name != "" && name != "-" {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
	n := 0
	for i := 1; ; i++ {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d: %v\n", i, err)
			os.Exit(1)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		kind := *as
		if kind == "" {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				fmt.Fprintf(os.Stderr, "document %d: %v\n", i, err)
				os.Exit(1)
			}
			kind = meta.Kind
		}
		obj, err := target(kind)
		if err == nil {
			err = yaml.UnmarshalStrict(doc, obj)
		}
		if err == nil {
			err = check(obj)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "document %d (%s): %v\n", i, kind, err)
			os.Exit(1)
		}
		n++
	}
	fmt.Printf("%d documents decoded strictly\n", n)
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}
