#!/bin/bash
# Writes server.properties from KAFKA_* variables (KAFKA_LOG_DIRS -> log.dirs), formats the log
# directory on first start (KRaft, CLUSTER_ID), then runs the broker in the foreground.
set -euo pipefail
config=/opt/kafka/config/server.properties
: > "$config"
while IFS='=' read -r name value; do
  [[ $name == KAFKA_* && $name != KAFKA_HEAP_OPTS ]] || continue
  key=$(echo "${name#KAFKA_}" | tr '[:upper:]' '[:lower:]' | tr '_' '.')
  echo "$key=$value" >> "$config"
done < <(env)
grep -q '^log.dirs=' "$config" || echo "log.dirs=/var/lib/kafka/data" >> "$config"
logs=$(sed -n 's/^log.dirs=//p' "$config" | cut -d, -f1)
java=(java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms512m} -XX:+UseSerialGC -Djava.awt.headless=true
      -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties -cp '/opt/kafka/libs/*')
if [[ ! -f "$logs/meta.properties" ]]; then
  "${java[@]}" kafka.tools.StorageTool format -t "${CLUSTER_ID:?set CLUSTER_ID (22 characters, base64)}" -c "$config"
fi
exec "${java[@]}" kafka.Kafka "$config"
