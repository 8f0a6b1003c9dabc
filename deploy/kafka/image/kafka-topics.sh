#!/bin/bash
# The apache/kafka image's kafka-topics.sh, for the same health check: TopicCommand on the jars.
exec java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp '/opt/kafka/libs/*' \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties org.apache.kafka.tools.TopicCommand "$@"
