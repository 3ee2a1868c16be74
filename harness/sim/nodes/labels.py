"""Readable node labels ("megan-0"): seeded, unique within a cluster, display-only.

A node is *named* by its integer index everywhere in the API; these labels only make
charts and logs readable. The list is built in (drawn once from Faker's en_US first
names): importing Faker to draw 32 names cost a cold 32-node cluster about a second.
"""

from __future__ import annotations

import random

__all__ = ["NameMaker", "FIRST_NAMES"]

FIRST_NAMES: tuple[str, ...] = (
    "aaron", "adriana", "alexa", "alexis", "alfred", "amber", "andre", "angela", "anita",
    "anna", "annette", "antonio", "ariel", "ashley", "audrey", "autumn", "bailey", "barbara",
    "barry", "becky", "benjamin", "bernard", "betty", "beverly", "bianca", "bill", "billy",
    "blake", "bobby", "brady", "brandi", "brandy", "breanna", "brenda", "brendan", "brent",
    "brian", "bridget", "brittany", "brittney", "brooke", "bryce", "calvin", "candice", "carl",
    "carla", "carly", "casey", "cassidy", "chelsea", "chris", "christie", "clayton", "clinton",
    "cody", "colleen", "collin", "connie", "connor", "craig", "dakota", "dalton", "dana",
    "danielle", "danny", "darrell", "debbie", "debra", "dennis", "derrick", "desiree", "devin",
    "diana", "dillon", "don", "donald", "donna", "doris", "dustin", "edwin", "ellen", "erik",
    "felicia", "frank", "fred", "gabriel", "gail", "gilbert", "gina", "glen", "gordon", "greg",
    "gregg", "gregory", "hailey", "harry", "hayden", "hector", "hunter", "ian", "isaiah",
    "ivan", "jackie", "jaclyn", "jade", "jaime", "jake", "jared", "jasmin", "javier", "jean",
    "jeanette", "jeffery", "jenna", "jesus", "jill", "jillian", "joanna", "joanne", "jocelyn",
    "jody", "johnny", "jonathon", "jordan", "jorge", "joshua", "joyce", "kathleen", "kathy",
    "katie", "kayla", "kaylee", "keith", "kelli", "kelly", "kerri", "kim", "kirsten", "kristie",
    "kristy", "krystal", "kyle", "lacey", "laura", "lauren", "leonard", "levi", "lindsay",
    "lindsey", "logan", "lonnie", "lori", "lorraine", "louis", "luke", "madison", "marcus",
    "margaret", "marie", "marilyn", "marisa", "marissa", "martha", "mary", "mathew", "matthew",
    "maxwell", "megan", "melissa", "mia", "micheal", "mike", "misty", "mitchell", "morgan",
    "nathan", "norman", "olivia", "omar", "oscar", "patty", "paul", "penny", "peter", "phyllis",
    "preston", "rachael", "rachel", "renee", "rickey", "rita", "robyn", "rose", "sabrina",
    "samuel", "sandra", "scott", "shari", "shawna", "sheila", "shelly", "sheri", "sherry",
    "shirley", "sonia", "sophia", "stacie", "stanley", "steve", "steven", "sue", "susan",
    "suzanne", "sydney", "sylvia", "tabitha", "tammie", "tara", "taylor", "teresa", "theodore",
    "tiffany", "tim", "timothy", "tina", "todd", "toni", "tony", "traci", "travis", "tyler",
    "vickie", "victor", "victoria", "virginia", "wanda", "william", "willie", "yolanda",
    "zachary",
)


class NameMaker:
    """``next(index)`` -> a seeded, readable label unique within this maker."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)
        self._used: set[str] = set()

    def next(self, index: int) -> str:
        for _ in range(20):
            name = f"{self._rng.choice(FIRST_NAMES)}-{index}"
            if name not in self._used:
                self._used.add(name)
                return name
        return f"node-{index}"
