// The components of rollwire's Jaeger build: replaces cmd/jaeger/internal/components.go of
// github.com/jaegertracing/jaeger v1.75.0 at compile time (`go build -overlay`, see
// deploy/stack/images.py), so that only what deploy/jaeger/config.yaml uses is compiled: traces
// over OTLP into memory, read back by the query service and its UI. The full set (Kafka, Zipkin,
// tail sampling, Prometheus, AWS auth ...) was most of the compile's time.

package internal

import (
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"

	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/exporters/storageexporter"
	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/extension/jaegerquery"
	"github.com/jaegertracing/jaeger/cmd/jaeger/internal/extension/jaegerstorage"
)

// Components are the factories the collector may configure.
func Components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{}
	if factories.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](
		jaegerstorage.NewFactory(), jaegerquery.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](storageexporter.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if factories.Connectors, err = otelcol.MakeFactoryMap[connector.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	return factories, nil
}
