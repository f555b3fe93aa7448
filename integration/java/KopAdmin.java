import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.QuorumInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/**
 * What Kafka's admin tools ask of a broker, through the Java AdminClient: describeTopics (DescribeTopicPartitions
 * from kafka-clients 3.8 on), listTopics with and without internal topics, describeMetadataQuorum and
 * describeConfigs with synonyms. Prints one "summary" JSON line. Options: --bootstrap, --topic, [--prop k=v].
 */
public final class KopAdmin {
    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String topic = args.required("topic");
        try (Admin admin = Admin.create(args.clientProperties())) {
            TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames()
                .get(30, TimeUnit.SECONDS).get(topic);
            List<Object> partitions = new ArrayList<>();
            for (TopicPartitionInfo info : description.partitions()) {
                partitions.add(Map.of("partition", info.partition(), "leader", info.leader().id(),
                    "replicas", info.replicas().size()));
            }
            QuorumInfo quorum = admin.describeMetadataQuorum().quorumInfo().get(30, TimeUnit.SECONDS);
            List<Object> voters = new ArrayList<>();
            quorum.voters().forEach(voter -> voters.add(voter.replicaId()));
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            Config config = admin.describeConfigs(List.of(resource), new DescribeConfigsOptions().includeSynonyms(true))
                .all().get(30, TimeUnit.SECONDS).get(resource);
            Map<String, Object> configs = new LinkedHashMap<>();
            for (ConfigEntry entry : config.entries()) {
                List<Object> synonyms = new ArrayList<>();
                entry.synonyms().forEach(s -> synonyms.add(List.of(s.name(), s.source().name())));
                configs.put(entry.name(), Map.of("value", String.valueOf(entry.value()),
                    "source", entry.source().name(), "synonyms", synonyms));
            }
            Json.object()
                .put("type", "summary")
                .put("topic_partitions", partitions)
                .put("internal", description.isInternal())
                .put("topics", admin.listTopics().names().get(30, TimeUnit.SECONDS))
                .put("topics_with_internal",
                     admin.listTopics(new ListTopicsOptions().listInternal(true)).names().get(30, TimeUnit.SECONDS))
                .put("quorum_leader", quorum.leaderId())
                .put("quorum_voters", voters)
                .put("configs", configs)
                .emit();
        }
    }
}
