"""The pipeline's built-in example: generated orders, and a transform that enriches and aggregates them.

Input records are orders as JSON lines, {"order_id", "customer", "items": [{"sku", "category", "quantity",
"price_cents"}]}; the transform gives each order's customer a region and tier (enrich) and sums the order's items per
category (aggregate): one output per order and category, keyed by customer."""
import json
import random

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

CATEGORIES = ("books", "games", "garden", "kitchen", "music")
REGIONS = ("north", "south", "east", "west")
ORDER_SCHEMA = ("order_id string, customer string, "
                "items array<struct<sku: string, category: string, quantity: int, price_cents: int>>")


def generate_orders(path: str, orders: int, seed: int, customers: int = 50) -> None:
    """Write `orders` orders as JSON lines, the same for the same seed."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for n in range(orders):
            items = [{"sku": f"sku-{rng.randrange(500)}", "category": rng.choice(CATEGORIES),
                      "quantity": rng.randint(1, 5), "price_cents": rng.randint(100, 10_000)}
                     for _ in range(rng.randint(1, 4))]
            out.write(json.dumps({"order_id": f"{seed}-{n}", "customer": f"customer-{rng.randrange(customers)}",
                                  "items": items}) + "\n")


def enrich_and_aggregate(orders: DataFrame) -> DataFrame:
    """Orders (Kafka source rows) -> per order and category: customer, region, tier, items, quantity, amount in cents."""
    parsed = orders.select("partition", "offset", F.from_json(F.col("value").cast("string"), ORDER_SCHEMA)
                           .alias("order"))
    customer = F.col("order.customer")
    enriched = parsed.select(
        "partition", "offset", F.col("order.order_id").alias("order_id"), customer.alias("customer"),
        F.element_at(F.array(*map(F.lit, REGIONS)), F.pmod(F.hash(customer), F.lit(len(REGIONS))) + 1)
        .alias("region"),
        F.when(F.pmod(F.hash(customer, F.lit("tier")), F.lit(10)) == 0, "gold").otherwise("standard").alias("tier"),
        F.explode("order.items").alias("item"))
    totals = enriched.groupBy("partition", "offset", "order_id", "customer", "region", "tier", "item.category").agg(
        F.count(F.lit(1)).alias("items"), F.sum("item.quantity").alias("quantity"),
        F.sum(F.col("item.quantity") * F.col("item.price_cents")).alias("amount_cents"))  # integers: exact in any order
    value = F.to_json(F.struct("order_id", "customer", "region", "tier", "category", "items", "quantity",
                               "amount_cents"))
    return totals.select("partition", "offset", F.col("customer").alias("key"), value.alias("value"))
